"""``python -m grpo_dashboard ...`` is the ``grpo-dashboard`` command."""

import sys

from grpo_dashboard.cli import main

sys.exit(main())
