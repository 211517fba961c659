"""Differential privacy's parts every process shares: noise no one else can rebuild."""
