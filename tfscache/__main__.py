from tfscache.cli import main

raise SystemExit(main())
