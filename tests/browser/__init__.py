"""Browser tests: Playwright driving Debian's Chromium (/usr/bin/chromium) against the stack."""
