"""tuning_study: an Optuna study over the trainer's hyper-parameters, and the definitions that tune
new versions.
"""
