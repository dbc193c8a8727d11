"""Learned reward models (ORM and PRM) and their training inside a run. Needs torch."""
