"""Training procedures chosen by ``train.procedure``: the registry (:mod:`.registry`), NCR
(:mod:`.ncr`), Meta-SPN (:mod:`.metaspn`), AOQ's offline negatives (:mod:`.aoq`) and the
pair-model memory bank (:mod:`.pair_bank`)."""
