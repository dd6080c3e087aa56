"""A published model, written and read: the dense export, the model folder and the predictor.

``export`` writes (and loads) the TorchScript dense network, ``model_folder`` owns the
export root's ``donefile.txt`` and each model's ``MODEL.json``, ``predict`` loads a
published model and scores raw examples (the reference the serving room is checked against).
"""
