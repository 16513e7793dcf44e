"""The SQLite quota store (the default): the store itself (``store``), its memory mode with a
write-behind journal (``memory``, ``batches``), the owner/sharer hand-over between processes
(``owner``) and the reservation shapes both modes share (``parts``)."""
