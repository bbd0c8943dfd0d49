"""Loss comparison runner: the same model trained with each loss and seed, then tables and plots.

``vlret compare CONFIG --losses triplet,infonce,unified,goal,vsl,adacl --seeds 3 [--out DIR]
[--goal-grid] [--set k=v ...]`` and ``vlret sweep CONFIG --param margin=0,0.1,0.2 --param
gamma=20,40,60 [--loss unified]`` call :func:`compare` and :func:`sweep`.

CONFIG is an ordinary run config (see :mod:`vlret.run.config`) with an optional ``[compare]``
section::

    [compare]
    output_dir = "runs/compare_f30k"   # default of --out (else <output_dir>/compare or /sweep)
    seeds = 3                          # default of --seeds (else 1); seeds are train.seed + k
    protocol = "f30k"                  # test protocol (default: from the data, below)
    split = "test"                     # test split (default: test, or the protocol's own)
    data = "data/f30k_precomp"         # test data folder (default data.root)
    checkpoint = "best"                # best (dev-selected, as the papers) or last
    eval_batch_size = 256

    [compare.losses.unified]           # one table per variant; the table name is its label
    margin = 0.2
    gamma = 60.0

    [compare.losses.triplet-hn]        # a label other than a loss name needs `name`
    name = "triplet"
    hardest = true
    set = ["train.all_negatives_epochs=0"]   # run-config overrides for this variant only;
                                             # in them {seed} is the run's seed, {out} OUT

    [compare.losses.triplet-hn-m05]    # an ablation: runs only when --losses names it
    name = "triplet"
    margin = 0.05
    default = false

Without ``protocol``, MS-COCO data is tested on ``coco5k`` (a precomp folder with ``coco`` in
its name, or a Karpathy JSON whose ``dataset`` is ``coco``:
:func:`~vlret.analysis.compare.spec.coco_data`), other data by its format's registered default
(``f30k`` for precomp and Karpathy, ``msrvtt-full`` for MSR-VTT); without ``split``, ``test``
where the protocol evaluates it, else its 5K split (``testall`` of precomputed COCO,
:func:`~vlret.analysis.compare.spec.default_split`).

A variant's loss parameters are layered: the registry defaults, then the config's ``[loss]``
section when it names the same loss, then the variant's table. ``--losses`` defaults to the
labels of ``[compare.losses]`` in file order (except the tables with ``default = false``),
else the six papers' losses
(:data:`PAPER_LOSSES`). ``--goal-grid`` adds the 15 GOAL (triplet weight, pair weight)
combinations, labelled ``goal-{T}-{P}``, with the other parameters of the ``goal`` variant.
Train settings that only apply to some losses are dropped for the others, as their
capabilities say (:func:`vlret.losses.loss_capabilities`): ``all_negatives_epochs`` where
``all_negatives_warmup`` (see :mod:`vlret.run.warmup`), ``momentum_encoder`` where the loss
owns a queue that takes ``momentum_keys``.
``--set compare.KEY=VALUE`` overrides the ``[compare]`` section; other ``--set`` overrides
apply to the run config as in ``vlret train``.

Layout of OUT: ``runs/{label}/seed{seed}/`` (the trainer's folder plus ``spec.json``, the
resolved settings of the run, and ``result.json``, its test evaluation's own record,
:meth:`vlret.eval.Evaluation.record`, with the run's label, loss, seed and epochs), ``table.md``,
``results.csv``, ``results.json``, ``curves.md`` (the dev selection metric, rsum unless
``train.select_on`` names another, and dev similarities against epochs, mean +- std over
seeds), ``goal_grid.md`` (with ``--goal-grid``) and ``plots/*.png``.
The dev similarity curves read ``dev_pos_sim`` / ``dev_hardest_neg_sim``, which the trainer
logs in each epoch record of ``metrics.jsonl``.

Before any run trains, the test protocol, split and data folder are checked against every
run's data format, and the test split is opened in the data folder as the evaluation will open
it, its images counted against the protocol's folds (:func:`check_eval_plan`): a world with only
``testall`` under the default ``split = "test"`` is refused in one line naming ``compare.split``
and ``compare.protocol``, not after every run has trained. When the test data folder is a
synthetic world (``synthetic.json``, :mod:`vlret.worlds`), each run is also scored with
:func:`~vlret.worlds.evaluate_synthetic` on the same split: clone forced choice,
R-Precision / mAP@R on the exhaustive relevance and T->I R@1 of the secondary-content captions
(``result.json`` key ``synthetic``; extra columns of ``results.csv`` / ``results.json`` and a
second table in ``table.md``), from the run's :class:`~vlret.eval.Evaluation`: its split, its
two-tower embeddings or its score matrix (:func:`synthetic_extras`).

Person search: with person-search data (``data.format`` ``cuhk-pedes``, ``icfg-pedes`` or
``rstpreid``) the protocol defaults to the one the registry declares for the format
(``compare.protocol = "cuhk-pedes"`` ... names it) and each run's ``best.pt`` is the epoch of
the best dev T->I R@1 (``train.select_on``; :mod:`vlret.run.config_checks`). ``table.md`` then
has the identity-level columns, T->I then I->T R@1, R@5, R@10, mAP and mINP (mean +- sample std
over seeds, the best in bold), ``results.csv`` / ``results.json`` those keys
(``identity_t2i_r1`` ... ``identity_i2t_minp``, each run's ``vlret eval`` record), and
``curves.md`` and the training-curves plot the dev metric the runs select on
(``dev_identity_t2i_r1``) against epochs, as AdaCL Fig. 7 plots R@1.
The synthetic world's extras do not apply and are skipped. Variants may be weighted
combinations: ``[compare.losses."sdm+id"]`` (or ``name = "sdm+id"``).

Resume: a run is finished when its ``result.json`` exists, and is then read, not retrained; a
run with a ``last.pt`` continues from it through the trainer's exact resume; any other run
starts afresh. A run folder whose ``spec.json`` differs from the current settings is an error
(use another ``--out`` or delete the folder), so changed settings never mix with old results.
Ctrl-C stops the current run at the next step after writing its ``last.pt``.

Modules: :mod:`~.spec` (the config, variants and runs), :mod:`~.runner` (training, testing,
resuming), :mod:`~.scoring` (the synthetic world's extras), :mod:`~.report` (tables and plots;
:func:`compare`) and :mod:`~.sweeps` (:func:`sweep`).
"""

from .report import ComparisonReport, add_plot, compare, write_report
from .runner import (
    RESULT_FILE,
    SPEC_FILE,
    ComparisonTrainer,
    RunOutcome,
    check_eval_plan,
    execute_run,
    is_finished,
    run_all,
    run_fingerprint,
)
from .scoring import evaluate_run, synthetic_extras, synthetic_root
from .spec import (
    COMPARE_KEYS,
    PAPER_LOSSES,
    CompareError,
    EvalSettings,
    RunSpec,
    Variant,
    eval_settings,
    goal_grid_variants,
    make_variant,
    parse_losses,
    plan_runs,
    read_compare_config,
    resolve_variants,
    run_config,
)
from .sweeps import parse_param, sweep, sweep_variants

__all__ = [
    "COMPARE_KEYS",
    "PAPER_LOSSES",
    "RESULT_FILE",
    "SPEC_FILE",
    "CompareError",
    "ComparisonReport",
    "ComparisonTrainer",
    "EvalSettings",
    "RunOutcome",
    "RunSpec",
    "Variant",
    "add_plot",
    "check_eval_plan",
    "compare",
    "eval_settings",
    "evaluate_run",
    "execute_run",
    "goal_grid_variants",
    "is_finished",
    "make_variant",
    "parse_losses",
    "parse_param",
    "plan_runs",
    "read_compare_config",
    "resolve_variants",
    "run_all",
    "run_config",
    "run_fingerprint",
    "sweep",
    "sweep_variants",
    "synthetic_extras",
    "synthetic_root",
    "write_report",
]
