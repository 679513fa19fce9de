# A tiny stand-in for SGLang: the static reader and real argparse must agree on it.
__version__ = "9.9.9"
