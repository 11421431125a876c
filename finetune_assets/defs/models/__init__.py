"""Model assets: finetuned_model (through a launcher), baseline_model, and the upstream versions a
step read.
"""
