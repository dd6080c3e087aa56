"""``python -m streamtrain_tools.bench.ps``: the room's headline benchmark, ``run``."""

import sys

from streamtrain_tools.bench.ps.run import main

sys.exit(main())
