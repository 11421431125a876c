"""Label sets: a version's ordered class names, how raw values map to them, how a source's set is
decided.
"""
