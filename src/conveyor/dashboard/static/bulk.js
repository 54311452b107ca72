// A bulk action's progress page posts its next batch by itself (the form works by hand too).
document.querySelectorAll("form[data-autosubmit]").forEach(function (form) { form.submit(); });
