"""Worker-side machinery: the evaluation loop, claiming and running runs, cancellation, receipts."""
