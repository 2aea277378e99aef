"""The client harness: connectors, transports and the rollout runner."""
