"""The seam every learner-syncer message crosses: the transport, direct channels, emulated links."""
