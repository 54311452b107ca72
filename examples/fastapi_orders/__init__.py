"""FastAPI shop: an order and the job that issues its receipt commit in one PostgreSQL transaction."""
