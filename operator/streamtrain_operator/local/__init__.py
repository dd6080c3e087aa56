"""Local mode (``streamtrain run``): the job's PS shards and workers as child processes of
this machine (``cluster``), the run around the driver (``runner``) and its terminal output
(``reporting``). Independent of ``kube``."""
