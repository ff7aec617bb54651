"""Running answers: their events for reconnects, their drafts saved while they stream,
and answers across fronts that share one PostgreSQL database."""
