"""From a source's reviews to validated rows and token ids: validation, duplicates, tokenization,
the token cache and index.
"""
