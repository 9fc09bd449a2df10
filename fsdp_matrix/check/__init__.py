"""``python -m fsdp_matrix check``: a user's FSDP and PEFT configs and versions, read by their own libraries, mapped
onto the matrix's axes, and answered with the known failures they will meet before a job is launched."""
