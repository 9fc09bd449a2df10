"""fsdp-matrix: does each reported PEFT x FSDP failure still reproduce, and does each fix still hold?"""

__version__ = "0.1.0"
