"""Test and demo support: tiny mock models built locally (never downloaded)."""
