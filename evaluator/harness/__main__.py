"""``python -m evaluator.harness --manifest … --target …`` (see ``evaluator.harness.cli``).

Runs the compiled build of the hot modules when one matches the sources (``--pure``: never);
see ``evaluator.harness.native``.
"""

import sys

from evaluator.harness.native import activate

if "--pure" not in sys.argv[1:]:
    activate()

# Imported only now: the choice above must come before anything imports the admission core.
from evaluator.harness.cli import main

sys.exit(main())
