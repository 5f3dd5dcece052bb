"""State transfer: a donor serves its state in chunks, a newcomer downloads and checks it."""
