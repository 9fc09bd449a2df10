"""``triage``: match a pasted traceback or log against the matrix's rules and records (``parse``, ``match``,
``cli``)."""
