"""Scores and the rules on them: metrics, the TF-IDF baseline, the gate's rules, inference,
vocabulary fit, benchmark sets, charts.
"""
