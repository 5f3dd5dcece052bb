"""Who may take part and whom to believe: admission (tokens, allowlists), the signed run
manifest, suspicion records, and the pure rules of the replicated-owner check."""
