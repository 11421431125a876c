"""Table sources read through their own engines: Delta (delta-rs), Iceberg (pyiceberg), SQL
(SQLAlchemy), and the ``--where`` predicate they share.
"""
