"""Start-up stages read from SGLang's own log lines, and what counts as progress in one.

A start that stops making progress (a rank waiting for a peer that never comes, a weight
read stuck on a dead mount) prints no error line; the machine watches for silence instead.
The stage names what SGLang was doing when it went quiet.
"""

from __future__ import annotations

from sglang_guard.common.record import record
from sglang_guard.rules.logline import is_record

# The stages, in the order SGLang 0.5.23 goes through them. "init" is everything outside a
# named stage: imports, argument resolution, process start-up, the steps between stages.
STAGES = ("init", "dist_init", "weights", "cuda_graph", "warmup")

# (stage entered, a literal the marker holds, the marker as an RE2 pattern), each read from
# SGLang 0.5.23's source (site-packages paths). The rule prefilter's RE2 set scans for the
# patterns in the same pass (rules/rules.Matcher.scan); the literal places the last one.
MARKERS: tuple[tuple[str, str, str], ...] = (
    # srt/distributed/bootstrap.py:115 and :190
    ("dist_init", "Init parallel begin.", r"Init parallel begin\."),
    ("init", "Init parallel ends.", r"Init parallel ends\."),
    # srt/model_executor/model_runner.py:1274 and :1373
    ("weights", "Load weight begin.", r"Load weight begin\."),
    ("init", "Load weight end.", r"Load weight end\."),
    # "Capture {role} prefill CUDA graph begin." and "Capture {role} decode {cuda graph}
    # begin." (srt/model_executor/model_runner_components/cuda_graph_setup.py:685, :759)
    ("cuda_graph", "graph begin.", r"Capture [^.\n]*(?i:graph) begin\."),
    ("init", "graph end.", r"Capture [^.\n]*(?i:graph) end\."),  # cuda_graph_setup.py:696, :788
    # uvicorn's "Uvicorn running on http://..." once the HTTP server is bound; SGLang's
    # warm-up request follows (srt/entrypoints/http_server.py:2600 ends it: ready to roll).
    ("warmup", "Uvicorn running on ", r"Uvicorn running on "),
)
_LITERALS = tuple(literal.encode() for _, literal, _ in MARKERS)
# The line SGLang prints once its warm-up request passed (0.5.23 srt/entrypoints/
# http_server.py:2600); the block scan finds it in the same pass as the markers.
READY_LINE = "The server is fired up and ready to roll!"


def last_stage(block: bytes, found: list[int]) -> str:
    """Of the markers `found` (indices into MARKERS) in `block`, the stage of the last one."""
    return max((block.rfind(_LITERALS[i]), MARKERS[i][0]) for i in found)[1]


def is_progress(tail: str, bar: bool) -> bool:
    """Whether output counts as progress: a redrawn progress bar or a record of SGLang's."""
    return bar or is_record(tail)  # SGLang's own lines, not a library's


@record
class Stalled:
    """No progress within the stage's limit: what the journal and /startupz report."""

    stage: str
    line: str  # the last line the child printed
    silent_s: float  # seconds without progress when it was noticed
