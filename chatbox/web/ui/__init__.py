"""The HTML UI: pages and the htmx partials behind them, login, Markdown rendering, templates."""
