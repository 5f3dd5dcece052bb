"""Everything that crosses the network: DHT node, rounds, collectives, robust reducers, SWARM."""
