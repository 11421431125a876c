"""A tuning trial seen from inside the trainer: its reports to the study (pruning) and the study's
storage, which the trainer opens in a pod as the asset does.
"""
