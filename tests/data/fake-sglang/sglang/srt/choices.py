import enum
import os

BACKENDS = ["triton", "fa3"]
EXTRA = BACKENDS + ["flashinfer"]
MAP = {"a": 1, "b": 2}
SAMPLING = {"pytorch", "flashinfer", "ascend"}
if os.environ.get("FAKE_SGLANG_EXTRA"):
    SAMPLING.add("token_oracle")


class Mode(enum.Enum):
    NONE = 0
    PARTIAL = 1
    ALL = 2
