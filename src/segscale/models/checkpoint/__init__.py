"""Everything that knows the checkpoint format, in the layer training and inference share.

Writing (``files``: atomic, with a digest), the record a checkpoint carries
(``record``: ``CheckpointRecord``, its schema and checks), the network it describes
(``network``), and the one pass every reader takes (``reading``: open and verify once,
parse the record, build the network, load its weights), with what inference and
``model.init_from`` make of it (``trained``, ``init_from``) and ``evaluate.py``'s classes
and data taken from it (``recorded_classes``, ``recorded_data``).
"""
