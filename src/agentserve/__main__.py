from agentserve.cli import main

raise SystemExit(main())
