"""The evaluation engine: rulesets, requests, the bounded scheduler, attempts, adapters, receipts.

Plain Python and asyncio on top of `admission.core`; it imports neither Django, DRF nor Celery,
so the load harness and benchmarks run it on virtual time. The Django app around it
(`evaluator.models`, `services`, `tasks`, the database receipt store) feeds it requests and keeps
its results.
"""
