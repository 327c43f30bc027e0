"""The demo app: two job handlers (``fq_handlers``) and the table the email handler records sends in."""
