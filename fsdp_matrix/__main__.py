from fsdp_matrix.cli import main

raise SystemExit(main())
