"""``python -m evaluator.harness --manifest … --target …`` (see ``evaluator.harness.cli``)."""

import sys

from evaluator.harness.cli import main

sys.exit(main())
