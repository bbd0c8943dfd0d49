"""MSR-VTT: the full test split (2990 videos x 20 captions; video-to-text ranks the best of a
video's 20 captions, the dual-encoding definition) and JSFUSION's 1k-A test (1000 videos x 1
caption, no dev videos)."""

from .registry import EvalProtocol, register_protocol

MSRVTT_FULL = register_protocol(
    EvalProtocol(
        name="msrvtt-full",
        title="MSR-VTT full test (v2t: best of each video's captions)",
        summary="MSR-VTT test: 2990 videos x 20 captions, v2t ranks a video's best caption",
        paper_set="MSR-VTT full",
        paper_splits=("test",),
        paper_images=2990,
        paper_texts=59800,
        splits={"msrvtt": ("test", "dev")},
        relevance="any-caption-of-video",
        data_protocol="full",
        default_for=("msrvtt",),
    )
)
MSRVTT_1KA = register_protocol(
    EvalProtocol(
        name="msrvtt-1ka",
        title="MSR-VTT 1k-A test",
        summary="MSR-VTT 1k-A test (JSFUSION): 1000 videos x 1 caption",
        paper_set="MSR-VTT 1k-A",
        paper_splits=("test",),
        paper_images=1000,
        paper_texts=1000,
        splits={"msrvtt": ("test",)},
        relevance="any-caption-of-video",
        data_protocol="1k-A",
    )
)
