"""Flask sign-up: a new user and their welcome email job commit in one PostgreSQL transaction."""
