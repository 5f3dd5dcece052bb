"""Bytes on streams: the framed transport, persistent channels, message headers, the
receive mailbox with its quotas, buffer reuse and the byte ledger."""
