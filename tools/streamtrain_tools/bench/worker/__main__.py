"""``python -m streamtrain_tools.bench.worker``: the room's headline benchmark, ``run``."""

from streamtrain_tools.bench.worker.run import main

main()
