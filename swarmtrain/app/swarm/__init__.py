"""SWARM roles in a real run: stage servers and trainers, and the single-process reference."""
