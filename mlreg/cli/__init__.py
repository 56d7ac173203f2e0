"""The ``mlreg`` command line: parse, call one core function, render."""
