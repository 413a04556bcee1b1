"""The run folder: the one package that writes it and the one way to read it back.

``<storage_path>/<name>/`` holds ``config.json``, the tables (``<table>.parquet`` and their
parts while the run goes), ``nodes.json``, ``attempts.json``, ``summary.json``, the lock and
Ray Train's checkpoints. Here: their names and columns (``run_files``, ``records``,
``checkpoint_names``), a driver's opening of the folder (``folder``: locked, checked,
created whole by ``run_dir``), the lock (``run_lock``), the
table writer (``writer``), local or URI storage and the copy beside a URI (``storage``,
``remote_copy``), checkpoints (``checkpoints``), and the readers the report and the app use
(``readers``, ``table_cache``, ``trajectory``). ``lint-imports`` keeps the file, lock and
Parquet primitives in this package.
"""
