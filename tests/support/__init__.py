"""What the tests share: fakes, fixtures, and ways to run the plugin and the daemon.

Imported as ``tests.support.<module>``; pytest puts the repository root on
``sys.path`` (``pythonpath`` in pyproject.toml), and the scripts run by path
(benchmarks, stress, hostnode) put it there themselves.
"""
