"""What the tests share: the daemon harness, raw and SDK clients, the sign-in provider, the balancer."""
