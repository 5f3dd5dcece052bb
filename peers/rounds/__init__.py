"""The round engine: forming a group, one round's I/O and deadlines, the butterfly data phase,
the commit agreement, the owner check, the Byzantine guard and the collective built on them."""
