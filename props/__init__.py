"""kvstab's property suite, installed as ``kvstab.props``.

Run it from any directory against a scheduler of your own::

    pytest --pyargs kvstab.props --scheduler my_package.my_module:SCHEDULER

In a kvstab checkout ``pytest props/`` runs the same files.  See ``docs/props.md``.
"""
