"""What the user sees: pure view-data builders (`data`), text/HTML fallbacks and anywidget classes."""
