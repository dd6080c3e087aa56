"""``python -m streamtrain_tools.bench.peer``: the room's headline benchmark, ``run``."""

import sys

from streamtrain_tools.bench.peer.run import main

sys.exit(main())
