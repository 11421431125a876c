"""Dataset versions: the dynamic partitions, registration, the landing sensors, what ended a
version's run.
"""
