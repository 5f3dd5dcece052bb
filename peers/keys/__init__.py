"""Identity and signing: a peer's libp2p key pair on disk, and signatures over records."""
