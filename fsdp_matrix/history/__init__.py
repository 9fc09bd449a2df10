"""The history of nights: every night's records in one SQLite file (db.py), and a static HUD page over it (hud.py).
``python -m fsdp_matrix history add|hud`` (cli.py)."""
