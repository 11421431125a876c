"""Storage: the storage root, the one atomic write, lock and JSON read, what assets publish, where
MLflow tracks.
"""
