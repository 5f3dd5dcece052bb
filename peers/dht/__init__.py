"""The DHT node and what lives in it: peer records, signed records, the manifest service,
link probes, the read-only monitor, and the lifecycle of peer processes."""
